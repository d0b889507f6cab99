# Webhooks in, orders enriched, results to Postgres: a shop posts its order events over HTTP, a
# table holds its customers, a lookup adds each order's customer, and a sql sink keeps a row per
# order in PostgreSQL, updated (upsert) as the order is created, paid and shipped.
#
#   createdb shop && psql shop -f examples/pipelines/shop/schema.sql
#   flowrun run examples/pipelines/shop --var token=s3cret
#   curl -i http://127.0.0.1:8080/orders -H 'Authorization: Bearer s3cret' \
#     -H 'Content-Type: application/x-ndjson' -H 'Idempotency-Key: batch-1' \
#     --data-binary $'{"event":"order.paid","order_id":"1","customer_id":"c1","amount":42.5,"at":"2024-05-01T10:00:00Z"}\n'
#   psql shop -c 'TABLE orders'
#
# Effectively-once delivery: a client's retry with the same Idempotency-Key is written once, and
# a row committed to the database by a process that died before it acknowledged the message in
# Redis is not written again (the sink keeps a ledger in the same transaction as the rows).

pipeline "shop" {
  key_prefix = "shop"
  delivery   = "effectively_once"
}

variable "dsn" {
  type        = string
  default     = "postgres://postgres@127.0.0.1:5432/shop?sslmode=disable"
  sensitive   = true
  description = "The PostgreSQL database of the orders table (schema.sql next to this file)."
}

variable "address" {
  type        = string
  default     = "127.0.0.1:8080"
  description = "Where the webhooks source listens: the loopback unless a host says otherwise."
}

variable "token" {
  type        = string
  default     = null
  sensitive   = true
  description = "The bearer token the shop sends with its requests; without one, requests need none."
}

variable "customers" {
  type        = string
  default     = null
  description = "The customers, as JSON lines; the sample next to this file when not set."
}

source "webhooks" {
  kind       = "http_server"
  output     = topic.order_events
  address    = var.address
  path       = "/orders"
  framing    = "auto"
  max_body   = "1MiB"
  auth_token = var.token
}

source "customers" {
  kind   = "file"
  path   = coalesce(var.customers, "${path.pipeline}/data/customers.jsonl")
  output = topic.customers
}

# Keyed by order: an order's events keep their order, so its row ends with its last status.
topic "order_events" {
  partitions = 4
  key        = msg.order_id
  max_lag    = 100000 # past it the source answers 429 and the shop tries again later
}

topic "customers" {
  partitions = 2
  key        = msg.customer_id
}

# The latest record of each customer.
table "customers" {
  input = topic.customers
}

stage "enriched" {
  kind    = "lookup"
  input   = topic.order_events
  table   = table.customers
  key     = msg.customer_id
  as      = "customer"
  missing = "null" # an order of a customer the table does not hold is written without a name
}

# The row, as the table has it: what the tests expect at the sink.
stage "row" {
  kind  = "map"
  input = stage.enriched
  set = {
    status        = replace(msg.event, "order.", "")
    customer_name = try(msg.customer.name, null)
    tier          = try(msg.customer.tier, null)
  }
  drop = ["event", "customer"]
}

sink "orders_db" {
  kind   = "sql"
  input  = stage.row
  driver = "postgres"
  dsn    = var.dsn
  table  = "orders"
  columns = {
    order_id      = msg.order_id
    status        = msg.status
    customer_id   = msg.customer_id
    customer_name = msg.customer_name
    tier          = msg.tier
    amount        = msg.amount
    updated_at    = msg.at
  }
  upsert = ["order_id"] # an order's later event updates its row
}
