# Orders enriched with their customers: a table holds the latest record of each customer, and a
# lookup stage adds it to each order at msg.customer.
#
#   flowrun run --until-drained examples/pipelines/enrich --var output=bin/enriched.jsonl
#
# The table is state in Redis, partitioned like its topic (by customer id), and kept as customers
# change. The orders are partitioned by order id: a lookup reads whichever partition of the table
# holds its customer, so the two topics need not be partitioned alike. A lookup starts once the
# table has caught up with what its topic held when the lookup started (as a job, with everything
# the customers file holds), and sees each later change once the table has committed it.

pipeline "enrich" {
  key_prefix  = "enrich"
  description = "Orders, each with the latest record of its customer."
}

variable "customers" {
  type        = string
  default     = null
  description = "The customers to load, as JSON lines; the sample next to this file when not set."
}

variable "orders" {
  type        = string
  default     = null
  description = "The orders to enrich, as JSON lines; the sample next to this file when not set."
}

variable "output" {
  type        = string
  default     = "enriched.jsonl"
  description = "Where the enriched orders go, a line each."
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

# A customer's records share a partition, in order: the table keeps the last one.
topic "customers" {
  partitions = 2
  key        = msg.customer_id
}

topic "orders" {
  partitions = 4
  key        = msg.order_id
}

# The latest record of each customer, keyed like its topic. A record whose payload is null deletes
# its customer.
table "customers" {
  input = topic.customers
}

stage "enriched" {
  kind    = "lookup"
  input   = topic.orders
  table   = table.customers
  key     = msg.customer_id
  as      = "customer"
  missing = "null" # an order of an unknown customer goes on with customer = null
}

sink "out" {
  kind  = "file"
  input = stage.enriched
  path  = var.output
  mode  = "truncate" # a rerun of the job replaces what the last one wrote
}
