# Revenue per customer per minute, from a shop's order export: the orders the shop sent twice count
# once, and an order that arrives after its minute was reported goes to late_orders instead of
# changing a result that was already written.
#
#   flowrun run --until-drained examples/pipelines/revenue --var output=bin/revenue.jsonl
#
# As a job, the end of the input closes every open minute, so the output is complete. Run as a
# service, a minute is reported once the orders' times have moved 10 seconds past its end.

pipeline "revenue" {
  key_prefix  = "revenue"
  description = "Orders, deduplicated by order id, summed per customer and minute of their creation."
}

variable "input" {
  type        = string
  default     = null
  description = "The order export to read, as JSON lines; the sample next to this file when not set."
}

variable "output" {
  type        = string
  default     = "revenue.jsonl"
  description = "Where the results go, a line per customer and minute."
}

locals {
  input = coalesce(var.input, "${path.pipeline}/data/orders.jsonl")
}

source "orders" {
  kind   = "file"
  path   = local.input
  output = topic.orders
}

# Keyed by customer: a customer's orders, and so every copy of one order, share a partition, which
# is where the dedupe and the windows keep their state. One partition keeps the watermark, and with
# it what counts as late, the same on every run of the example; each partition has its own.
topic "orders" {
  partitions = 1
  key        = msg.customer_id
}

stage "orders_once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.order_id
  within     = "24h"
  event_time = msg.created_at
}

stage "revenue_per_minute" {
  kind       = "aggregate"
  input      = stage.orders_once
  group_by   = msg.customer_id
  event_time = msg.created_at
  window {
    type = "tumbling"
    size = "1m"
  }
  grace = "10s"
  late  = topic.late_orders
  aggregate = {
    orders  = count()
    revenue = sum(msg.amount)
    buyers  = count_distinct(msg.user_id)
    biggest = max(msg.amount)
    first   = first(msg.order_id)
  }
}

topic "late_orders" {
  partitions = 1
}

sink "revenue" {
  kind  = "file"
  input = stage.revenue_per_minute
  path  = var.output
  mode  = "truncate" # a rerun of the job replaces what the last one wrote
}

sink "late" {
  kind  = "stdout"
  input = topic.late_orders
}
