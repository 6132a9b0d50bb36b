const config = { server: { host: 'localhost', port: 8080 }, features: ['a', 'b', 'c'], debug: false };

const {
  server: { host, port = 80 },
  features: [firstFeature, , thirdFeature = 'none', ...otherFeatures],
  debug: isDebug = true,
  ...rest
} = config;

let a = 1, b = 2;
[a, b] = [b, a];

const [head, ...tail] = 'hello'.split('');
const { length } = tail;

function area({ width = 1, height = width, unit: u = 'px' } = {}) {
  return `${width * height}${u}`;
}

function pick(obj, ...keys) {
  return Object.fromEntries(keys.filter((k) => k in obj).map((k) => [k, obj[k]]));
}

const swapPairs = (pairs) => pairs.map(([x, y]) => [y, x]);
const describe = ({ name, address: { city } = {} }) => `${name} from ${city ?? 'nowhere'}`;

let x, y;
({ x, y = 5 } = { x: 1 });
for (const { id, tags: [primary] = [] } of [{ id: 1, tags: ['t'] }, { id: 2 }]) {
  console.log(id, primary);
}
for (const [key, { value }] of new Map([['k', { value: 1 }]])) console.log(key, value);

try {
  JSON.parse('{');
} catch ({ name, message }) {
  console.log(name, message);
}

console.log(host, port, firstFeature, thirdFeature, otherFeatures, isDebug, rest);
console.log(a, b, head, tail, length, area({ width: 2 }), pick(config, 'debug'));
console.log(swapPairs([[1, 2]]), describe({ name: 'x' }), x, y);
