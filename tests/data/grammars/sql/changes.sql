INSERT INTO customers (customer_name, contact_name, city, country)
VALUES ('Cardinal', 'Tom B. Erichsen', 'Stavanger', 'Norway');

INSERT INTO users (name, age) VALUES ('Ann', 31), ('Bob', 27), ('O''Brien', 45);

INSERT INTO archive_orders SELECT * FROM orders WHERE order_date < '2020-01-01';

INSERT INTO events DEFAULT VALUES;

INSERT INTO accounts (email) VALUES ($1) RETURNING id;

UPDATE customers SET contact_name = 'Alfred Schmidt', city = 'Frankfurt' WHERE customer_id = 1;

UPDATE products SET price = price * 1.1 WHERE category_id IN (SELECT id FROM categories WHERE name = 'Books');

update inventory set qty = qty - 1, updated_at = now() where sku = ? and qty > 0;

DELETE FROM customers WHERE customer_name = 'Alfreds Futterkiste';

DELETE FROM sessions WHERE last_seen < :cutoff RETURNING user_id;

/* remove orphans */
DELETE FROM order_items WHERE NOT EXISTS (SELECT 1 FROM orders WHERE orders.id = order_items.order_id);
