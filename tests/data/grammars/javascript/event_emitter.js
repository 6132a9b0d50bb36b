'use strict';

/**
 * A minimal event emitter, in the style of Node's `events` module.
 */
class EventEmitter {
  #listeners = new Map();
  static defaultMaxListeners = 10;

  on(event, listener) {
    if (typeof listener !== 'function') {
      throw new TypeError(`listener must be a function, got ${typeof listener}`);
    }
    const list = this.#listeners.get(event) ?? [];
    list.push(listener);
    this.#listeners.set(event, list);
    if (list.length > EventEmitter.defaultMaxListeners) {
      console.warn(`possible memory leak: ${list.length} listeners for "${String(event)}"`);
    }
    return this;
  }

  once(event, listener) {
    const wrapper = (...args) => {
      this.off(event, wrapper);
      listener.apply(this, args);
    };
    wrapper.listener = listener;
    return this.on(event, wrapper);
  }

  off(event, listener) {
    const list = this.#listeners.get(event);
    if (!list) return this;
    const index = list.findIndex((l) => l === listener || l.listener === listener);
    if (index !== -1) list.splice(index, 1);
    if (list.length === 0) this.#listeners.delete(event);
    return this;
  }

  emit(event, ...args) {
    const list = this.#listeners.get(event);
    if (!list || list.length === 0) {
      if (event === 'error') throw args[0] instanceof Error ? args[0] : new Error('Unhandled error');
      return false;
    }
    for (const listener of [...list]) {
      listener.apply(this, args);
    }
    return true;
  }

  listenerCount(event) {
    return this.#listeners.get(event)?.length ?? 0;
  }

  get eventNames() {
    return Array.from(this.#listeners.keys());
  }
}

module.exports = { EventEmitter };
