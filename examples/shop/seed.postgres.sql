-- The shop warehouse for PostgreSQL: psql "$SHOP_WAREHOUSE_URL" -f examples/shop/seed.postgres.sql
DROP TABLE IF EXISTS orders;
DROP TABLE IF EXISTS customers;

CREATE TABLE customers (
    customer_id INTEGER PRIMARY KEY,
    full_name TEXT NOT NULL,
    email TEXT NOT NULL,
    created_at DATE NOT NULL,
    churned_at DATE NULL
);

-- No primary key: an imported table, so an order id may repeat.
CREATE TABLE orders (
    order_id INTEGER NOT NULL,
    customer_id INTEGER NOT NULL,
    amount NUMERIC(10, 2) NOT NULL,
    created_at DATE NOT NULL,
    shipped_at TIMESTAMPTZ NULL,
    cancelled_at TIMESTAMPTZ NULL
);

INSERT INTO customers VALUES (1, 'Ada Lovelace', 'ada@example.com', '2026-01-05', NULL);
INSERT INTO customers VALUES (2, 'Grace Hopper', 'grace@example.com', '2026-02-11', '2026-09-30');
-- A hostile name: ANSI colour codes, Unicode tag characters (invisible "IGNORE"), a bidi override.
INSERT INTO customers VALUES (3,
    'Mallory ' || chr(27) || '[31mRed' || chr(27) || '[0m'
      || chr(917577) || chr(917575) || chr(917582) || chr(917583) || chr(917586) || chr(917573)
      || chr(8238) || 'evil' || chr(8236) || ' Jones',
    'mallory@example.com', '2026-03-01', NULL);

INSERT INTO orders VALUES (101, 1, 40.00, '2026-11-01', NULL, NULL);
INSERT INTO orders VALUES (102, 1, 250.00, '2026-10-01', '2026-10-03', NULL);
INSERT INTO orders VALUES (103, 2, 20.00, '2026-09-01', NULL, '2026-09-02');
INSERT INTO orders VALUES (104, 2, 60.00, '2026-08-01', '2026-08-04', NULL);
INSERT INTO orders VALUES (105, 3, 500.00, '2026-11-20', NULL, NULL);
