# Orders with their customer's record as it was when the order was placed: a table keeps an hour of
# each customer's versions, by the time each took effect, and a lookup as of the order's time adds
# the one that held then.
#
#   flowrun run --until-drained examples/pipelines/tiers --var output=bin/tiers.jsonl
#
# An order waits until the table's watermark (the latest updated_at the table has read, in each of
# its partitions) has passed its created_at: no change that the table is still to read can then be
# the one that held. So each order gets the same record whatever arrives first, the order or the
# changes of its customer (docs/language.md#lookups-as-of-an-event-time). At the end of a job every
# order still waiting is answered from the whole table.

pipeline "tiers" {
  key_prefix  = "tiers"
  description = "Orders, each with its customer's record as it was when the order was placed."
}

variable "customers" {
  type        = string
  default     = null
  description = "The customers' records, as JSON lines with an updated_at; the sample next to this file when not set."
}

variable "orders" {
  type        = string
  default     = null
  description = "The orders, as JSON lines with a created_at; the sample next to this file when not set."
}

variable "output" {
  type        = string
  default     = "tiers.jsonl"
  description = "Where the orders go with their customer's record, a line each."
}

locals {
  customers = coalesce(var.customers, "${path.pipeline}/data/customers.jsonl")
  orders    = coalesce(var.orders, "${path.pipeline}/data/orders.jsonl")
}

source "customers" {
  kind   = "file"
  path   = local.customers
  output = topic.customers
}

source "orders" {
  kind   = "file"
  path   = local.orders
  output = topic.orders
}

topic "customers" {
  partitions = 2
  key        = msg.customer_id
}

topic "orders" {
  partitions = 4
  key        = msg.order_id
}

# Each customer's versions of the last hour of event time (and the one that held before), by the
# time each took effect.
table "customers" {
  input      = topic.customers
  history    = "1h"
  event_time = msg.updated_at
}

stage "priced" {
  kind    = "lookup"
  input   = topic.orders
  table   = table.customers
  key     = msg.customer_id
  as      = "customer"
  as_of   = msg.created_at # the record that held when the order was placed
  missing = "null"         # an order placed before its customer had a record goes on with customer = null
}

sink "out" {
  kind  = "file"
  input = stage.priced
  path  = var.output
  mode  = "truncate"
}
