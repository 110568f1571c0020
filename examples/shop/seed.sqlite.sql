-- The shop warehouse for SQLite: sqlite3 examples/shop/shop.db < examples/shop/seed.sqlite.sql
DROP TABLE IF EXISTS orders;
DROP TABLE IF EXISTS customers;

CREATE TABLE customers (
    customer_id INTEGER PRIMARY KEY,
    full_name TEXT NOT NULL,
    email TEXT NOT NULL,
    created_at TEXT NOT NULL,
    churned_at TEXT NULL
);

-- No primary key: an imported table, so an order id may repeat.
CREATE TABLE orders (
    order_id INTEGER NOT NULL,
    customer_id INTEGER NOT NULL,
    amount REAL NOT NULL,
    created_at TEXT NOT NULL,
    shipped_at TEXT NULL,
    cancelled_at TEXT NULL
);

INSERT INTO customers VALUES (1, 'Ada Lovelace', 'ada@example.com', '2026-01-05', NULL);
INSERT INTO customers VALUES (2, 'Grace Hopper', 'grace@example.com', '2026-02-11', '2026-09-30');
-- A hostile name: ANSI colour codes, Unicode tag characters (invisible "IGNORE"), a bidi override.
INSERT INTO customers VALUES (3,
    'Mallory ' || char(27) || '[31mRed' || char(27) || '[0m'
      || char(917577, 917575, 917582, 917583, 917586, 917573)
      || char(8238) || 'evil' || char(8236) || ' Jones',
    'mallory@example.com', '2026-03-01', NULL);

INSERT INTO orders VALUES (101, 1, 40.0, '2026-11-01', NULL, NULL);
INSERT INTO orders VALUES (102, 1, 250.0, '2026-10-01', '2026-10-03', NULL);
INSERT INTO orders VALUES (103, 2, 20.0, '2026-09-01', NULL, '2026-09-02');
INSERT INTO orders VALUES (104, 2, 60.0, '2026-08-01', '2026-08-04', NULL);
INSERT INTO orders VALUES (105, 3, 500.0, '2026-11-20', NULL, NULL);
