class Matrix {
  constructor(rows, cols, fill = 0) {
    this.rows = rows;
    this.cols = cols;
    this.data = new Float64Array(rows * cols).fill(fill);
  }

  static identity(n) {
    const m = new Matrix(n, n);
    for (let i = 0; i < n; i++) m.set(i, i, 1);
    return m;
  }

  static fromArray(arr) {
    const m = new Matrix(arr.length, arr[0].length);
    arr.forEach((row, i) => row.forEach((v, j) => m.set(i, j, v)));
    return m;
  }

  get(i, j) {
    return this.data[i * this.cols + j];
  }

  set(i, j, value) {
    this.data[i * this.cols + j] = value;
    return this;
  }

  get shape() {
    return [this.rows, this.cols];
  }

  multiply(other) {
    if (this.cols !== other.rows) {
      throw new RangeError(`shape mismatch: ${this.shape} x ${other.shape}`);
    }
    const out = new Matrix(this.rows, other.cols);
    for (let i = 0; i < this.rows; i++) {
      for (let k = 0; k < this.cols; k++) {
        const a = this.get(i, k);
        if (a === 0) continue;
        for (let j = 0; j < other.cols; j++) {
          out.data[i * out.cols + j] += a * other.get(k, j);
        }
      }
    }
    return out;
  }

  transpose() {
    const out = new Matrix(this.cols, this.rows);
    for (let i = 0; i < this.rows; ++i) for (let j = 0; j < this.cols; ++j) out.set(j, i, this.get(i, j));
    return out;
  }

  norm() {
    return Math.sqrt(this.data.reduce((s, v) => s + v ** 2, 0));
  }

  toString() {
    const lines = [];
    for (let i = 0; i < this.rows; i++) {
      lines.push(Array.from({ length: this.cols }, (_, j) => this.get(i, j).toFixed(2)).join('\t'));
    }
    return lines.join('\n');
  }
}

const m = Matrix.fromArray([[1, 2], [3, 4]]);
console.log(m.multiply(Matrix.identity(2)).transpose().toString(), m.norm());
console.log(0xff & 0b1010 | 0o17 ^ 1 << 3 >> 1 >>> 0, ~5, -(-3), +'42', 1e-7, 2.5e+3, 123n * 2n);
