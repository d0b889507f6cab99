# Nexmark query 0, pass-through: every bid, unchanged, through one stage. It measures what a hop
# costs.
#
#   flowrun run --until-drained bench/nexmark/q0.hcl --var bids=B.jsonl --var output=q0.jsonl

pipeline "nexmark_q0" {
  key_prefix = "nexmark-q0"
}

variable "bids" {
  type        = string
  description = "The Nexmark bids, as JSON lines."
}

variable "output" {
  type    = string
  default = "q0.jsonl"
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

stage "pass" {
  kind  = "map"
  input = topic.bids
}

sink "out" {
  kind  = "file"
  input = stage.pass
  path  = var.output
}
