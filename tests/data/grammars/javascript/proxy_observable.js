function observable(target, onChange) {
  const handler = {
    get(obj, prop, receiver) {
      const value = Reflect.get(obj, prop, receiver);
      return typeof value === 'object' && value !== null ? observable(value, onChange) : value;
    },
    set(obj, prop, value, receiver) {
      const old = obj[prop];
      const ok = Reflect.set(obj, prop, value, receiver);
      if (ok && old !== value) onChange({ type: 'set', prop, old, value });
      return ok;
    },
    deleteProperty(obj, prop) {
      const had = prop in obj;
      const ok = Reflect.deleteProperty(obj, prop);
      if (had && ok) onChange({ type: 'delete', prop });
      return ok;
    },
  };
  return new Proxy(target, handler);
}

class Signal {
  #value;
  #subscribers = new Set();

  constructor(value) {
    this.#value = value;
  }

  get value() {
    return this.#value;
  }

  set value(next) {
    if (Object.is(next, this.#value)) return;
    this.#value = next;
    this.#subscribers.forEach((fn) => fn(next));
  }

  subscribe(fn) {
    this.#subscribers.add(fn);
    fn(this.#value);
    return () => void this.#subscribers.delete(fn);
  }

  map(fn) {
    const derived = new Signal(fn(this.#value));
    this.subscribe((v) => (derived.value = fn(v)));
    return derived;
  }
}

const log = [];
const state = observable({ user: { name: 'Ada' }, count: 0 }, (change) => log.push(change));
state.count++;
state.user.name = 'Grace';
delete state.count;

const count = new Signal(1);
const doubled = count.map((n) => n * 2);
const unsubscribe = doubled.subscribe((v) => console.log('doubled', v));
count.value = 5;
unsubscribe();
count.value = 6;
console.log(log, doubled.value);
