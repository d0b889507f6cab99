# Nexmark query 7, highest bid: in each 10-second tumbling window, the highest bid, its auction
# and its bidder (on a tie in price, the highest of each).
#
#   flowrun run --until-drained bench/nexmark/q7.hcl --var bids=B.jsonl --var output=q7.jsonl

pipeline "nexmark_q7" {
  key_prefix = "nexmark-q7"
}

variable "bids" {
  type        = string
  description = "The Nexmark bids, as JSON lines."
}

variable "output" {
  type    = string
  default = "q7.jsonl"
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

stage "highest" {
  kind       = "aggregate"
  input      = topic.bids
  group_by   = "all"
  event_time = msg.dateTime
  window {
    type = "tumbling"
    size = "10s"
  }
  aggregate = {
    price   = max(msg.price)
    auction = max_by(msg.auction, msg.price)
    bidder  = max_by(msg.bidder, msg.price)
  }
}

sink "out" {
  kind  = "file"
  input = stage.highest
  path  = var.output
}
