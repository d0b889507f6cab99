# Orders counted per minute by two aggregates, one that drops late orders and one that
# dead-letters them, and deduplicated by a dedupe stage that drops duplicates: for the tests of
# what flowrun test counts of stateful stages.
pipeline "late_orders" {
  key_prefix = "late-orders"
}

topic "orders" {
  partitions = 1
  key        = msg.customer
}

stage "dropping" {
  kind       = "aggregate"
  group_by   = msg.customer
  input      = topic.orders
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  late      = "drop"
  aggregate = { orders = count() }
}

stage "dead_lettering" {
  kind       = "aggregate"
  group_by   = msg.customer
  input      = topic.orders
  event_time = msg.at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { orders = count() }
}

stage "once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.id
  within     = "1h"
  event_time = msg.at
}

sink "per_minute" {
  kind  = "stdout"
  input = stage.dropping
}

sink "per_minute_too" {
  kind  = "stdout"
  input = stage.dead_lettering
}

sink "orders" {
  kind  = "stdout"
  input = stage.once
}
