# A file-to-file ETL, meant to run as a job: flowrun run --until-drained reads the orders export,
# keeps completed orders, normalises them, writes one clean JSON line per order, and exits when the
# last line is written.

pipeline "orders_etl" {
  key_prefix = "orders-etl"
}

variable "input" {
  type        = string
  default     = null
  description = "The export to read; the sample next to this file when not set."
}

variable "output" {
  type        = string
  default     = "orders-clean.jsonl"
  description = "Where the clean orders go."
}

locals {
  input = coalesce(var.input, "${path.pipeline}/data/orders.jsonl")
}

source "export" {
  kind   = "file"
  path   = local.input
  output = topic.raw
}

topic "raw" {
  partitions = 2
  key        = msg.customer.id
}

stage "completed" {
  kind  = "filter"
  input = topic.raw
  where = msg.status == "completed" && length(msg.items) > 0
}

stage "normalise" {
  kind  = "map"
  input = stage.completed
  set = {
    order_id    = tostring(msg.id)
    customer_id = msg.customer.id
    email       = lower(trimspace(msg.customer.email))
    country     = upper(coalesce(msg.customer.country, "unknown"))
    items       = length(msg.items)
    total       = sum([for item in msg.items : item.price * item.qty])
    skus        = join(",", [for item in msg.items : item.sku])
  }
  drop = ["id", "customer", "status", "internal_note"]
}

sink "clean" {
  kind  = "file"
  input = stage.normalise
  path  = var.output
  mode  = "truncate" # a rerun of the job replaces what the last one wrote
}
