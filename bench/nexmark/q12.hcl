# Nexmark query 12, bids per bidder in each 10-second tumbling window of event time.
#
#   flowrun run --until-drained bench/nexmark/q12.hcl --var bids=B.jsonl --var output=q12.jsonl

pipeline "nexmark_q12" {
  key_prefix = "nexmark-q12"
}

variable "bids" {
  type        = string
  description = "The Nexmark bids, as JSON lines."
}

variable "output" {
  type    = string
  default = "q12.jsonl"
}

source "bids" {
  kind   = "file"
  path   = var.bids
  output = topic.bids
}

# Keyed by what the query groups by: each bidder's bids are in one partition as they are written,
# so the aggregate reads them there (keyed otherwise, it would read a repartition topic, a hop of
# its own).
topic "bids" {
  partitions = 4
  key        = msg.bidder
}

stage "per_bidder" {
  kind       = "aggregate"
  input      = topic.bids
  group_by   = msg.bidder
  event_time = msg.dateTime
  window {
    type = "tumbling"
    size = "10s"
  }
  aggregate = { bids = count() }
}

sink "out" {
  kind  = "file"
  input = stage.per_bidder
  path  = var.output
}
