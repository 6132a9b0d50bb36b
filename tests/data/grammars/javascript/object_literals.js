const key = 'dynamic';
const base = { inherited: true };
const settings = {
  name: 'app',
  'content-type': 'application/json',
  42: 'answer',
  0x10: 'sixteen',
  [key]: 1,
  [`${key}_2`]: 2,
  [Symbol.toStringTag]: 'Settings',
  default: 'kw',
  class: 'kw',
  new: 'kw',
  if: 'kw',
  get: 'contextual',
  set: 'contextual',
  static: 'contextual',
  of: 1,
  from: 2,
  as: 3,
  async: 4,
  await: 5,
  yield: 6,
  let: 7,
  ...base,
  nested: { deep: { deeper: [1, 2, { x: null }] } },
  method() {
    return this.name;
  },
  async load() {
    return await Promise.resolve(this[key]);
  },
  *items() {
    yield* Object.entries(this);
  },
  async *stream() {
    yield 1;
  },
  get upper() {
    return this.name.toUpperCase();
  },
  set upper(value) {
    this.name = value.toLowerCase();
  },
  get ['computed' + 'Getter']() {
    return 1;
  },
  'quoted method'() {},
  123() {},
  get() {},
  set() {},
  async() {},
  arrow: () => ({ wrapped: true }),
  fn: function named() {},
};

const shorthand = { key, base, settings };
const copy = { ...settings, name: 'copy', nested: { ...settings.nested } };
const frozen = Object.freeze({ __proto__: null, a: 1 });
const p = Promise.resolve(1);
p.catch(() => {}).finally(() => {});
settings.default = settings.class + settings.new;
console.log(shorthand.key, copy.upper, settings.method(), settings[42], frozen.a);
console.log(Object.keys(settings).length, settings.get(), typeof settings.async);
