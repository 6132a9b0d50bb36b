const express = require('express');
const path = require('path');

const app = express();
const PORT = Number(process.env.PORT) || 3000;
const items = new Map();
let nextId = 1;

app.use(express.json());
app.use(express.static(path.join(__dirname, 'public')));

app.use((req, res, next) => {
  const start = process.hrtime.bigint();
  res.on('finish', () => {
    const ms = Number(process.hrtime.bigint() - start) / 1e6;
    console.log(`${req.method} ${req.originalUrl} ${res.statusCode} ${ms.toFixed(1)}ms`);
  });
  next();
});

const asyncHandler = (fn) => (req, res, next) => Promise.resolve(fn(req, res, next)).catch(next);

app.get('/items', (req, res) => {
  const { limit = '10', offset = '0' } = req.query;
  const all = [...items.values()];
  res.json({ total: all.length, items: all.slice(+offset, +offset + +limit) });
});

app.post(
  '/items',
  asyncHandler(async (req, res) => {
    const { name, price } = req.body ?? {};
    if (typeof name !== 'string' || !name.trim()) {
      return res.status(400).json({ error: 'name is required' });
    }
    const item = { id: nextId++, name: name.trim(), price: Number(price) || 0, createdAt: new Date() };
    items.set(item.id, item);
    res.status(201).location(`/items/${item.id}`).json(item);
  }),
);

app.delete('/items/:id', (req, res) => {
  const deleted = items.delete(Number(req.params.id));
  res.sendStatus(deleted ? 204 : 404);
});

app.use((err, req, res, next) => {
  console.error(err.stack);
  res.status(err.status || 500).json({ error: err.message });
});

if (require.main === module) {
  app.listen(PORT, () => console.log(`listening on http://localhost:${PORT}`));
}

module.exports = app;
