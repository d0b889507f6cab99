# Nexmark query 1, currency conversion: every bid with its price in euros (0.908 a dollar).
#
#   flowrun run --until-drained bench/nexmark/q1.hcl --var bids=B.jsonl --var output=q1.jsonl

pipeline "nexmark_q1" {
  key_prefix = "nexmark-q1"
}

variable "bids" {
  type        = string
  description = "The Nexmark bids, as JSON lines."
}

variable "output" {
  type    = string
  default = "q1.jsonl"
}

source "bids" {
  kind   = "file"
  path   = var.bids
  output = topic.bids
}

topic "bids" {
  partitions = 4
  key        = msg.auction
}

stage "euros" {
  kind  = "map"
  input = topic.bids
  set   = { price = msg.price * 0.908 }
}

sink "out" {
  kind  = "file"
  input = stage.euros
  path  = var.output
}
