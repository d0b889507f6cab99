pipeline "t" {}
topic "orders" {
  partitions = 2
  key        = msg.customer
}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "once" {
  kind     = "dedupe"
  input    = topic.orders
  key      = msg.id
  within   = "1h"
  ordering = "none" # ERROR: Stateful stage without a lease: The dedupe stage "once" keeps state per input partition
}
stage "score" {
  kind     = "go"
  func     = "acme.score"
  input    = stage.once
  ordering = "none"
}
sink "out" {
  kind  = "stdout"
  input = stage.score
}
