# Nexmark query 5, hot items: in each 10-second window, sliding every 2 seconds, the auction with
# the most bids (on a tie, the one with the highest id).
#
#   flowrun run --until-drained bench/nexmark/q5.hcl --var bids=B.jsonl --var output=q5.jsonl

pipeline "nexmark_q5" {
  key_prefix = "nexmark-q5"
}

variable "bids" {
  type        = string
  description = "The Nexmark bids, as JSON lines."
}

variable "output" {
  type    = string
  default = "q5.jsonl"
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

stage "bids_per_auction" {
  kind       = "aggregate"
  input      = topic.bids
  group_by   = msg.auction
  event_time = msg.dateTime
  window {
    type    = "hopping"
    size    = "10s"
    advance = "2s"
  }
  aggregate = { bids = count() }
}

stage "hottest" {
  kind       = "aggregate"
  input      = stage.bids_per_auction
  group_by   = "all"
  event_time = msg.window.start
  window {
    type = "tumbling"
    size = "2s"
  }
  aggregate = {
    auction = max_by(msg.key, msg.bids)
    bids    = max(msg.bids)
  }
}

sink "out" {
  kind  = "file"
  input = stage.hottest
  path  = var.output
}
