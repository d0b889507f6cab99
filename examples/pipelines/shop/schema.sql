-- The table the shop example writes: a row per order, updated as its events arrive. The sql sink
-- never creates or alters a table; create it once in the database that var.dsn names:
--
--   createdb shop && psql shop -f examples/pipelines/shop/schema.sql
CREATE TABLE IF NOT EXISTS orders (
  order_id      text PRIMARY KEY,
  status        text NOT NULL,
  customer_id   text NOT NULL,
  customer_name text,
  tier          text,
  amount        numeric(12, 2) NOT NULL CHECK (amount >= 0),
  updated_at    timestamptz NOT NULL
);
