function* range(start, end, step = 1) {
  for (let i = start; step > 0 ? i < end : i > end; i += step) {
    yield i;
  }
}

function* take(iterable, n) {
  if (n <= 0) return;
  for (const item of iterable) {
    yield item;
    if (--n === 0) return;
  }
}

function* naturals() {
  let n = 0;
  while (true) yield n++;
}

function* flatten(tree) {
  for (const node of tree) {
    if (Array.isArray(node)) yield* flatten(node);
    else yield node;
  }
}

function* fibonacci() {
  let [a, b] = [0, 1];
  for (;;) {
    const reset = yield a;
    if (reset) [a, b] = [0, 1];
    else [a, b] = [b, a + b];
  }
}

const lazy = {
  *map(iterable, fn) {
    for (const x of iterable) yield fn(x);
  },
  *filter(iterable, pred) {
    for (const x of iterable) if (pred(x)) yield x;
  },
};

const squares = [...lazy.map(take(naturals(), 5), (x) => x * x)];
const evens = Array.from(lazy.filter(range(0, 10), (x) => x % 2 === 0));
const fib = fibonacci();
console.log(squares, evens, [...flatten([1, [2, [3, [4]]]])]);
console.log(fib.next().value, fib.next().value, fib.next().value, fib.next(true).value);
console.log([...range(10, 0, -3)]);
