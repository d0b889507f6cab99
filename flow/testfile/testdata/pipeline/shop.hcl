# The pipeline that the test-file fixtures test.
pipeline "shop" {
  key_prefix = "shop"
}

variable "events" {
  type    = number
  default = 10
}

variable "url" {
  type    = string
  default = "http://127.0.0.1:1/hook"
}

topic "orders" {
  partitions = 2
}

topic "enriched" {}

source "orders" {
  kind     = "generate"
  count    = var.events
  output   = topic.orders
  template = { id = index }
}

stage "score" {
  kind   = "go"
  func   = "acme.score"
  input  = topic.orders
  output = topic.enriched
}

stage "tag" {
  kind  = "map"
  input = topic.enriched
  set   = { tagged = true }
}

sink "out" {
  kind  = "stdout"
  input = stage.tag
}

sink "hook" {
  kind  = "http"
  input = topic.enriched
  url   = var.url
}
