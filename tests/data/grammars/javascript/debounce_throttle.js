function debounce(fn, wait = 100, { leading = false } = {}) {
  let timer = null;
  let pending = false;
  function debounced(...args) {
    const callNow = leading && timer === null;
    clearTimeout(timer);
    pending = !callNow;
    timer = setTimeout(() => {
      timer = null;
      if (pending) fn.apply(this, args);
      pending = false;
    }, wait);
    if (callNow) fn.apply(this, args);
  }
  debounced.cancel = function () {
    clearTimeout(timer);
    timer = null;
    pending = false;
  };
  return debounced;
}

function throttle(fn, interval) {
  let last = 0;
  let trailing;
  return function throttled(...args) {
    const now = Date.now();
    const remaining = interval - (now - last);
    if (remaining <= 0) {
      last = now;
      return fn.apply(this, args);
    }
    clearTimeout(trailing);
    trailing = setTimeout(() => {
      last = Date.now();
      fn.apply(this, args);
    }, remaining);
  };
}

function memoize(fn, keyOf = (...args) => JSON.stringify(args)) {
  const cache = new Map();
  return (...args) => {
    const key = keyOf(...args);
    if (!cache.has(key)) cache.set(key, fn(...args));
    return cache.get(key);
  };
}

const once = (fn) => {
  let done = false, result;
  return (...args) => (done ? result : ((done = true), (result = fn(...args))));
};

module.exports = { debounce, throttle, memoize, once };
