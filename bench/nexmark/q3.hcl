# Nexmark query 3, local item suggestion: who sells in Oregon, Idaho or California in category 10,
# and which auctions. Auctions are looked up in a table of people (the sellers), which holds each
# person's record; run as a job, the lookup waits until the people's file is all in the table.
#
#   flowrun run --until-drained bench/nexmark/q3.hcl --var persons=P.jsonl --var auctions=A.jsonl --var output=q3.jsonl

pipeline "nexmark_q3" {
  key_prefix = "nexmark-q3"
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
  default = "q3.jsonl"
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

table "persons" {
  input = topic.persons
}

stage "category_10" {
  kind  = "filter"
  input = topic.auctions
  where = msg.category == 10
}

stage "with_seller" {
  kind    = "lookup"
  input   = stage.category_10
  table   = table.persons
  key     = msg.seller
  as      = "seller_record"
  missing = "drop"
}

stage "local" {
  kind  = "filter"
  input = stage.with_seller
  where = contains(["OR", "ID", "CA"], msg.seller_record.state)
}

stage "suggestion" {
  kind  = "map"
  input = stage.local
  set = {
    name  = msg.seller_record.name
    city  = msg.seller_record.city
    state = msg.seller_record.state
  }
  drop = ["itemName", "description", "initialBid", "reserve", "expires", "category", "seller_record"]
}

sink "out" {
  kind  = "file"
  input = stage.suggestion
  path  = var.output
}
