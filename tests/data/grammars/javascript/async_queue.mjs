/** Run async tasks with bounded concurrency. */
export async function mapLimit(items, limit, worker) {
  const results = new Array(items.length);
  let next = 0;
  async function run() {
    while (next < items.length) {
      const i = next++;
      results[i] = await worker(items[i], i);
    }
  }
  const runners = Array.from({ length: Math.min(limit, items.length) }, run);
  await Promise.all(runners);
  return results;
}

export class AsyncQueue {
  #items = [];
  #waiters = [];
  #closed = false;

  push(item) {
    if (this.#closed) throw new Error('queue closed');
    const waiter = this.#waiters.shift();
    if (waiter) waiter({ value: item, done: false });
    else this.#items.push(item);
  }

  close() {
    this.#closed = true;
    for (const waiter of this.#waiters.splice(0)) waiter({ value: undefined, done: true });
  }

  next() {
    if (this.#items.length > 0) {
      return Promise.resolve({ value: this.#items.shift(), done: false });
    }
    if (this.#closed) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  [Symbol.asyncIterator]() {
    return this;
  }
}

export async function* batched(source, size) {
  let batch = [];
  for await (const item of source) {
    batch.push(item);
    if (batch.length >= size) {
      yield batch;
      batch = [];
    }
  }
  if (batch.length) yield batch;
}

const queue = new AsyncQueue();
setTimeout(() => {
  [1, 2, 3, 4, 5].forEach((n) => queue.push(n));
  queue.close();
}, 10);
for await (const batch of batched(queue, 2)) {
  console.log(batch);
}
console.log(await mapLimit([3, 1, 2], 2, async (n) => n * 2));
