# Scores orders with ACME's Go function acme.score, keeps the risky ones, and writes them as JSON
# lines and, through ACME's own sink kind acme_csv, as a CSV sheet. Only a flowrun binary with the
# function and the kind compiled in (examples/plugins/flowrun-acme) can validate or run it:
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
