SELECT department_id, COUNT(*) AS headcount, AVG(salary) AS avg_salary
FROM employees
GROUP BY department_id
HAVING COUNT(*) > 5
ORDER BY avg_salary DESC;

SELECT country, SUM(amount) total, MAX(amount), MIN(amount)
FROM payments GROUP BY country HAVING SUM(amount) >= 1000.50;

SELECT customer_id, COUNT(DISTINCT product_id) FROM order_items GROUP BY customer_id;

SELECT name,
       CASE WHEN score >= 90 THEN 'A'
            WHEN score >= 80 THEN 'B'
            ELSE 'C' END AS grade
FROM results;

SELECT CASE status WHEN 1 THEN 'active' WHEN 0 THEN 'inactive' END FROM accounts;

SELECT COALESCE(nickname, first_name) || ' ' || last_name AS display_name FROM people;

SELECT CAST(price AS DECIMAL(10, 2)), created_at::date, UPPER(TRIM(name)) FROM items;

SELECT name, salary, RANK() OVER (PARTITION BY department_id ORDER BY salary DESC) AS r
FROM employees;

SELECT EXTRACT_YEAR(order_date) AS y, ROUND(AVG(total), 2) FROM orders GROUP BY 1 ORDER BY 1 NULLS LAST;
