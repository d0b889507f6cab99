# Nexmark query 2, selection: the bids on every 123rd auction, with their prices.
#
#   flowrun run --until-drained bench/nexmark/q2.hcl --var bids=B.jsonl --var output=q2.jsonl

pipeline "nexmark_q2" {
  key_prefix = "nexmark-q2"
}

variable "bids" {
  type        = string
  description = "The Nexmark bids, as JSON lines."
}

variable "output" {
  type    = string
  default = "q2.jsonl"
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

stage "selected" {
  kind  = "filter"
  input = topic.bids
  where = msg.auction % 123 == 0
}

stage "auction_price" {
  kind  = "map"
  input = stage.selected
  drop  = ["bidder", "channel", "url", "dateTime"]
}

sink "out" {
  kind  = "file"
  input = stage.auction_price
  path  = var.output
}
