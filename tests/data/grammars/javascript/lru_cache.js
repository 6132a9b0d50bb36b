class LRUCache {
  constructor(capacity = 100, { ttl = Infinity, onEvict = () => {} } = {}) {
    if (!Number.isInteger(capacity) || capacity < 1) {
      throw new RangeError('capacity must be a positive integer');
    }
    this.capacity = capacity;
    this.ttl = ttl;
    this.onEvict = onEvict;
    this.map = new Map();
    this.stats = { hits: 0, misses: 0, evictions: 0 };
  }

  get(key) {
    const entry = this.map.get(key);
    if (entry === undefined) {
      this.stats.misses++;
      return undefined;
    }
    if (entry.expires < Date.now()) {
      this.map.delete(key);
      this.stats.misses++;
      return undefined;
    }
    this.map.delete(key);
    this.map.set(key, entry);
    this.stats.hits++;
    return entry.value;
  }

  set(key, value) {
    if (this.map.has(key)) this.map.delete(key);
    this.map.set(key, { value, expires: Date.now() + this.ttl });
    while (this.map.size > this.capacity) {
      const [oldestKey, oldest] = this.map.entries().next().value;
      this.map.delete(oldestKey);
      this.stats.evictions += 1;
      this.onEvict(oldestKey, oldest.value);
    }
    return this;
  }

  has(key) {
    return this.get(key) !== undefined;
  }

  get size() {
    return this.map.size;
  }

  get hitRate() {
    const total = this.stats.hits + this.stats.misses;
    return total === 0 ? 0 : this.stats.hits / total;
  }

  *keys() {
    yield* this.map.keys();
  }
}

const cache = new LRUCache(2, { onEvict: (k, v) => console.log('evicted', k, v) });
cache.set('a', 1).set('b', 2);
cache.get('a');
cache.set('c', 3);
console.log([...cache.keys()], cache.size, cache.hitRate.toFixed(2));
