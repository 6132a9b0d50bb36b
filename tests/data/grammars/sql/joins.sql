-- joins of every kind
SELECT o.order_id, c.customer_name, o.order_date
FROM orders o
INNER JOIN customers c ON o.customer_id = c.customer_id;

SELECT c.customer_name, o.order_id
FROM customers c
LEFT JOIN orders o ON c.customer_id = o.customer_id
ORDER BY c.customer_name;

SELECT e.last_name, d.department_name
FROM employees e RIGHT OUTER JOIN departments d ON e.department_id = d.department_id;

SELECT * FROM table_a a FULL OUTER JOIN table_b b ON a.key = b.key WHERE a.key IS NULL OR b.key IS NULL;

SELECT s.name, c.title FROM students s CROSS JOIN courses c;

SELECT * FROM employees NATURAL JOIN departments;

SELECT a.id, b.value FROM a JOIN b USING (id);

SELECT e1.name AS employee, e2.name AS manager
FROM employees e1
LEFT JOIN employees e2 ON e1.manager_id = e2.id
JOIN departments d ON d.id = e1.department_id AND d.active = TRUE;
