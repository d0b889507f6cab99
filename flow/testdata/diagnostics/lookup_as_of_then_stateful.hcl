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
stage "as_of_then_window" { # ERROR: Not supported yet: A stateful stage after the lookup stage "as_of_then_window" is not supported yet
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
