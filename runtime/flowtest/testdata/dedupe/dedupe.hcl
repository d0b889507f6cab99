# A dedupe stage of orders, for the tests of stateful stages under flowrun test.
pipeline "orders_once" {
  key_prefix = "orders-once"
}

topic "orders" {
  partitions = 1
  key        = msg.order_id
}

topic "dupes" {
  partitions = 1
}

stage "once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.order_id
  within     = "1h"
  event_time = msg.at
  duplicates = topic.dupes
}

sink "out" {
  kind  = "stdout"
  input = stage.once
}

sink "dupes" {
  kind  = "stdout"
  input = topic.dupes
}
