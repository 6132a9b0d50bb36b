// Fetch JSON with retries, a timeout and exponential backoff.
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

export class HttpError extends Error {
  constructor(response, body) {
    super(`HTTP ${response.status} ${response.statusText}`);
    this.name = 'HttpError';
    this.status = response.status;
    this.body = body;
  }
}

export async function fetchJson(url, { retries = 3, timeout = 5000, headers = {}, ...init } = {}) {
  let lastError;
  for (let attempt = 0; attempt <= retries; attempt++) {
    const controller = new AbortController();
    const timer = setTimeout(() => controller.abort(), timeout);
    try {
      const response = await fetch(url, {
        ...init,
        headers: { Accept: 'application/json', ...headers },
        signal: controller.signal,
      });
      if (!response.ok) {
        const body = await response.text();
        if (response.status >= 500 && attempt < retries) {
          lastError = new HttpError(response, body);
          await sleep(2 ** attempt * 100);
          continue;
        }
        throw new HttpError(response, body);
      }
      return await response.json();
    } catch (err) {
      if (err instanceof HttpError) throw err;
      lastError = err;
      if (attempt === retries) break;
      await sleep(2 ** attempt * 100 + Math.random() * 50);
    } finally {
      clearTimeout(timer);
    }
  }
  throw lastError;
}

export default fetchJson;
