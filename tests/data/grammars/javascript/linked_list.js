class Node {
  constructor(value, next = null) {
    this.value = value;
    this.next = next;
  }
}

class LinkedList {
  constructor(iterable = []) {
    this.head = null;
    this.tail = null;
    this.size = 0;
    for (const item of iterable) this.append(item);
  }

  append(value) {
    const node = new Node(value);
    if (this.tail) {
      this.tail.next = node;
    } else {
      this.head = node;
    }
    this.tail = node;
    this.size += 1;
    return this;
  }

  prepend(value) {
    this.head = new Node(value, this.head);
    if (!this.tail) this.tail = this.head;
    this.size++;
    return this;
  }

  remove(value) {
    let prev = null;
    for (let node = this.head; node; prev = node, node = node.next) {
      if (node.value === value) {
        if (prev) prev.next = node.next;
        else this.head = node.next;
        if (node === this.tail) this.tail = prev;
        this.size--;
        return true;
      }
    }
    return false;
  }

  reverse() {
    let prev = null, node = this.head;
    [this.head, this.tail] = [this.tail, this.head];
    while (node) {
      const next = node.next;
      node.next = prev;
      prev = node;
      node = next;
    }
    return this;
  }

  *[Symbol.iterator]() {
    for (let node = this.head; node !== null; node = node.next) {
      yield node.value;
    }
  }

  toArray() {
    return [...this];
  }

  toString() {
    return this.toArray().join(' -> ');
  }

  static from(...values) {
    return new LinkedList(values);
  }
}

const list = LinkedList.from(1, 2, 3).append(4).prepend(0);
list.remove(2);
console.log(String(list.reverse()), list.size);
