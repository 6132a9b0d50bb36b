class ValidationError extends Error {
  constructor(field, message, options) {
    super(message, options);
    this.name = 'ValidationError';
    this.field = field;
  }
}

class NotFoundError extends Error {
  name = 'NotFoundError';
  status = 404;
}

function validateUser(user) {
  const errors = [];
  if (typeof user?.email !== 'string' || !user.email.includes('@')) {
    errors.push(new ValidationError('email', 'invalid email'));
  }
  if (!Number.isInteger(user?.age) || user.age < 0) {
    errors.push(new ValidationError('age', `invalid age: ${user?.age}`));
  }
  if (errors.length) throw new AggregateError(errors, 'user is invalid');
  return true;
}

function parseJsonSafe(text, fallback = null) {
  try {
    return JSON.parse(text);
  } catch (err) {
    if (err instanceof SyntaxError) return fallback;
    throw err;
  }
}

async function withRetry(task, { attempts = 3, isRetryable = (e) => !(e instanceof ValidationError) } = {}) {
  let lastError;
  for (let i = 1; i <= attempts; i++) {
    try {
      return await task(i);
    } catch (error) {
      lastError = error;
      if (!isRetryable(error)) break;
    } finally {
      console.debug(`attempt ${i} finished`);
    }
  }
  throw new Error('all attempts failed', { cause: lastError });
}

try {
  validateUser({ email: 'nope', age: -1 });
} catch (e) {
  if (e instanceof AggregateError) {
    for (const { field, message } of e.errors) console.log(field, message);
  } else {
    throw e;
  }
}

console.log(parseJsonSafe('{"a":1}'), parseJsonSafe('{oops', {}));
withRetry(async (i) => {
  if (i < 2) throw new NotFoundError('missing');
  return i;
}).then(console.log, (e) => console.error(e.cause));
