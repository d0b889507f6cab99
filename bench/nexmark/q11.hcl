# Nexmark query 11, user sessions: the bids of each bidder per session, a session ending after
# 10 seconds without one.
#
#   flowrun run --until-drained bench/nexmark/q11.hcl --var bids=B.jsonl --var output=q11.jsonl

pipeline "nexmark_q11" {
  key_prefix = "nexmark-q11"
}

variable "bids" {
  type        = string
  description = "The Nexmark bids, as JSON lines."
}

variable "output" {
  type    = string
  default = "q11.jsonl"
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

stage "sessions" {
  kind       = "aggregate"
  input      = topic.bids
  group_by   = msg.bidder
  event_time = msg.dateTime
  window {
    type = "session"
    gap  = "10s"
  }
  aggregate = { bids = count() }
}

sink "out" {
  kind  = "file"
  input = stage.sessions
  path  = var.output
}
