# A starter pipeline, written by flowrun init: paid orders from a file of JSON lines, summed per
# customer and minute, into another file. README.md says how to run and test it.

pipeline "{{NAME}}" {
  description = "Paid orders summed per customer and minute."
}

variable "output" {
  type        = string
  default     = "totals.jsonl"
  description = "Where the totals go, a JSON line per customer and minute."
}

source "orders" {
  kind   = "file"
  path   = "${path.pipeline}/data/orders.jsonl"
  output = topic.orders
}

# Keyed by customer: a customer's orders share a partition, where their totals are kept. One
# partition keeps the test simple: a minute closes once a later order of its partition arrives, and
# with more partitions, one that gets no orders would hold it open until it goes idle.
topic "orders" {
  partitions = 1
  key        = msg.customer
}

stage "paid" {
  kind  = "filter"
  input = topic.orders
  where = msg.status == "paid"
}

stage "per_minute" {
  kind       = "aggregate"
  input      = stage.paid
  group_by   = msg.customer
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = {
    orders  = count()
    revenue = sum(msg.amount)
  }
}

sink "totals" {
  kind  = "file"
  input = stage.per_minute
  path  = var.output
  mode  = "truncate" # a rerun replaces what the last one wrote
}
