function loadUser(id) {
  return fetch(`/api/users/${id}`)
    .then((res) => {
      if (!res.ok) throw new Error(`status ${res.status}`);
      return res.json();
    })
    .then((user) => Promise.all([user, fetch(`/api/users/${id}/posts`).then((r) => r.json())]))
    .then(([user, posts]) => ({ ...user, posts }))
    .catch((err) => {
      console.error('failed to load user', id, err);
      return null;
    })
    .finally(() => console.log('done', id));
}

function timeout(promise, ms) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error('timed out after ' + ms + 'ms')), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

function promisify(fn) {
  return (...args) =>
    new Promise((resolve, reject) => {
      fn(...args, (err, value) => (err ? reject(err) : resolve(value)));
    });
}

Promise.allSettled([loadUser(1), timeout(loadUser(2), 1000)]).then((results) => {
  for (const { status, value, reason } of results) {
    console.log(status, status === 'fulfilled' ? value : reason.message);
  }
});

module.exports = { loadUser, timeout, promisify };
