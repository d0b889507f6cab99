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
  kind       = "dedupe"
  input      = topic.orders
  key        = "${msg.id}-${uuid()}" # ERROR: uuid() gives another value on every call
  within     = "1h"
  event_time = timestamp() # ERROR: timestamp() gives another value on every call
}
stage "revenue" {
  kind     = "aggregate"
  group_by = msg.customer
  input    = topic.orders
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = {
    ids = count_distinct(uuid()) # ERROR: uuid() gives another value on every call
  }
}
sink "out" {
  kind  = "stdout"
  input = stage.revenue
}
sink "once_out" {
  kind  = "stdout"
  input = stage.once
}
