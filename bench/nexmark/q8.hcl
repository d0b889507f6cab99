# Nexmark query 8, monitor new users: the people who opened an auction in the same 10-second
# tumbling window in which they joined. A join of people (left) and auctions (right): each is
# keyed by the person and its window (the person's id, the auction's seller), so that only the
# events of one window meet, and the span (10 seconds either way) lets every pair of a window match.
#
#   flowrun run --until-drained bench/nexmark/q8.hcl --var persons=P.jsonl --var auctions=A.jsonl --var output=q8.jsonl

pipeline "nexmark_q8" {
  key_prefix = "nexmark-q8"
}

variable "persons" {
  type        = string
  description = "The Nexmark people, as JSON lines."
}

variable "auctions" {
  type        = string
  description = "The Nexmark auctions, as JSON lines."
}

variable "output" {
  type    = string
  default = "q8.jsonl"
}

source "persons" {
  kind   = "file"
  path   = var.persons
  output = topic.persons
}

source "auctions" {
  kind   = "file"
  path   = var.auctions
  output = topic.auctions
}

topic "persons" {
  partitions = 4
  key        = msg.id
}

topic "auctions" {
  partitions = 4
  key        = msg.id
}

stage "new_sellers" {
  kind = "join"
  left {
    input      = topic.persons
    key        = "${msg.id}/${floor(msg.dateTime / 10000)}"
    event_time = msg.dateTime
  }
  right {
    input      = topic.auctions
    key        = "${msg.seller}/${floor(msg.dateTime / 10000)}"
    event_time = msg.dateTime
  }
  before = "10s"
  after  = "10s"
  select = {
    id      = left.id
    name    = left.name
    window  = floor(left.dateTime / 10000) * 10000
    auction = right.id
    reserve = right.reserve
  }
}

sink "out" {
  kind  = "file"
  input = stage.new_sellers
  path  = var.output
}
