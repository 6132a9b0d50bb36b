function findPair(matrix, target) {
  let found = null;
  search: for (let i = 0; i < matrix.length; i++) {
    for (let j = 0; j < matrix[i].length; j++) {
      if (matrix[i][j] < 0) continue search;
      if (matrix[i][j] === target) {
        found = [i, j];
        break search;
      }
    }
  }
  return found;
}

function countdown(n) {
  const out = [];
  do {
    out.push(n);
  } while (--n > 0);
  return out;
}

function gcd(a, b) {
  while (b !== 0) [a, b] = [b, a % b];
  return Math.abs(a);
}

function collatz(n) {
  let steps = 0;
  for (; n !== 1; steps++) n = n % 2 === 0 ? n / 2 : 3 * n + 1;
  return steps;
}

function keysAndValues(obj) {
  const keys = [], values = [];
  for (var key in obj) {
    if (!Object.prototype.hasOwnProperty.call(obj, key)) continue;
    keys.push(key);
  }
  for (const value of Object.values(obj)) values.push(value);
  return { keys, values };
}

function classify(n) {
  if (n < 0) return 'negative';
  else if (n === 0) return 'zero';
  else if (n < 10) {
    return 'small';
  } else return 'large';
}

let total = 0;
block: {
  total += 1;
  if (total > 0) break block;
  total += 100;
}
for (const ch of 'abc') total += ch.charCodeAt(0);
for (let i = 0, j = 10; i < j; i += 2, j -= 2);
while (false);

console.log(findPair([[1, 2], [3, 4]], 4), countdown(3), gcd(12, 18), collatz(27));
console.log(keysAndValues({ x: 1, y: 2 }), [-1, 0, 5, 50].map(classify), total);
