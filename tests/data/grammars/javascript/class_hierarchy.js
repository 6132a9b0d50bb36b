class Shape {
  static #instances = 0;
  static count() {
    return Shape.#instances;
  }

  #name;

  constructor(name) {
    if (new.target === Shape) throw new TypeError('Shape is abstract');
    this.#name = name;
    Shape.#instances++;
  }

  get name() {
    return this.#name;
  }

  set name(value) {
    if (!value) throw new RangeError('empty name');
    this.#name = value;
  }

  area() {
    throw new Error('not implemented');
  }

  toString() {
    return `${this.constructor.name}(${this.#name}, area=${this.area().toFixed(2)})`;
  }

  static compare(a, b) {
    return a.area() - b.area();
  }
}

class Circle extends Shape {
  radius = 1;

  constructor(radius) {
    super('circle');
    this.radius = radius;
  }

  area() {
    return Math.PI * this.radius ** 2;
  }

  get diameter() {
    return this.radius * 2;
  }
}

class Rect extends Shape {
  constructor(w, h, name = 'rect') {
    super(name);
    Object.assign(this, { w, h });
  }

  area() {
    return this.w * this.h;
  }

  toString() {
    return 'Rect:' + super.toString();
  }
}

class Square extends Rect {
  constructor(side) {
    super(side, side, 'square');
  }

  static of(side) {
    return new this(side);
  }
}

const Named = (Base) =>
  class extends Base {
    describe() {
      return `I am ${this.name}`;
    }
  };

const NamedCircle = class NamedCircle extends Named(Circle) {};
const shapes = [new Circle(1), new Rect(2, 3), Square.of(2), new NamedCircle(0.5)];
shapes.sort(Shape.compare);
for (const s of shapes) console.log(String(s));
console.log(Shape.count(), shapes[0] instanceof Shape, shapes.at(-1).describe?.());
