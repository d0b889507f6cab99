pipeline "t" {}
topic "customers" {
  partitions = 2
  key        = msg.customer_id
}
topic "orders" {
  partitions = 4
}
source "cin" {
  kind   = "stdin"
  output = topic.customers
}
source "oin" {
  kind   = "stdin"
  output = topic.orders
}
table "history" {
  input   = topic.customers
  history = "1h"
}
stage "as_of_then_window" { # ERROR: Event times differ: The lookup stage "as_of_then_window" passes a message on once its table's watermark passes the message's msg.created_at
  kind  = "lookup"
  input = topic.orders
  table = table.history
  key   = msg.customer_id
  as    = "customer"
  as_of = msg.created_at
}
stage "counts" {
  kind     = "aggregate"
  input    = stage.as_of_then_window
  group_by = msg.customer_id
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
sink "e" {
  kind  = "stdout"
  input = stage.counts
}

# The same event time as the lookup's as_of: allowed, the lookup holds its watermark back.
stage "as_of_then_same_time" {
  kind  = "lookup"
  input = topic.orders
  table = table.history
  key   = msg.customer_id
  as    = "customer"
  as_of = msg.created_at
}
stage "counts_by_created_at" {
  kind       = "aggregate"
  input      = stage.as_of_then_same_time
  group_by   = msg.customer_id
  event_time = msg.created_at
  window {
    type = "tumbling"
    size = "1m"
  }
  aggregate = { n = count() }
}
sink "f" {
  kind  = "stdout"
  input = stage.counts_by_created_at
}
