# Nexmark query 0, pass-through: every bid, unchanged, from the source's topic to the sink. It
# measures what the way in and out of Redis costs. (Until 2026-12-06 it passed the bids through a
# map stage that changed nothing, a hop Nexmark's query does not have, and that validate warns
# about: FW-1 measures a hop.)
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

sink "out" {
  kind  = "file"
  input = topic.bids
  path  = var.output
}
