# Scores orders with ACME's Go function acme.score, keeps the risky ones, and writes them as JSON
# lines and, through ACME's own sink kind acme_csv, as a CSV sheet. Beside it, ACME's stateful
# function acme.velocity passes on the orders of customers who order again within ten minutes. Only
# a flowrun binary with the functions and the kind compiled in (examples/plugins/flowrun-acme) can
# validate or run it:
#
#   go build -o bin/flowrun-acme ./examples/plugins/flowrun-acme
#   bin/flowrun-acme run examples/plugins/pipeline --until-drained

pipeline "risk" {
  key_prefix = "risk"
}

variable "input" {
  type    = string
  default = null
}

variable "output" {
  type    = string
  default = "risky-orders.jsonl"
}

variable "sheet" {
  type    = string
  default = "risky-orders.csv"
}

variable "bursts" {
  type    = string
  default = "order-bursts.jsonl"
}

topic "orders" {
  partitions = 2
  key        = msg.customer
}

source "orders" {
  kind   = "file"
  path   = coalesce(var.input, "${path.pipeline}/orders.jsonl")
  output = topic.orders
}

stage "score" {
  kind        = "go"
  func        = "acme.score"
  input       = topic.orders
  concurrency = 4
}

stage "risky" {
  kind  = "filter"
  input = stage.score
  where = msg.risk >= 50
}

sink "review" {
  kind  = "file"
  input = stage.risky
  path  = var.output
}

sink "review_sheet" {
  kind    = "acme_csv"
  input   = stage.risky
  path    = var.sheet
  columns = ["id", "customer", "risk"]
}

# A customer's recent orders are state of their partition (the topic is keyed by customer), kept in
# Redis with the acknowledgements and forgotten by a timer ten minutes after the customer's latest
# order. The stage is stateful because its function is: its ordering must not be "none".
stage "velocity" {
  kind  = "go"
  func  = "acme.velocity"
  input = topic.orders
}

sink "bursts" {
  kind  = "file"
  input = stage.velocity
  path  = var.bursts
}
