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
table "customers" {
  input  = topic.customers
  global = true
  ttl    = "30d"
}
table "ttl_zero" {
  input = topic.customers
  ttl   = "0s" # ERROR: Invalid ttl: ttl is how long a key is kept after its last update
}
table "products" {
  input = topic.customers
  key   = "sku" # ERROR: Invalid key: A table's key must read the message
}
stage "unknown_table" {
  kind  = "lookup"
  input = topic.orders
  table = table.customer # ERROR: Reference to undeclared table: There is no table named "customer". Did you mean "customers"?
  key   = msg.customer_id
  as    = "customer"
}
stage "wrong_ref" {
  kind  = "lookup"
  input = topic.orders
  table = topic.customers # ERROR: Invalid reference: table takes a reference to a table
  key   = msg.customer_id
  as    = "customer"
}
stage "bad_attributes" {
  kind    = "lookup"
  input   = topic.orders
  table   = table.products
  key     = "customer_id" # ERROR: Invalid key: key is computed from each message
  as      = "" # ERROR: Invalid as: as names the field the row lands at
  missing = "skip" # ERROR: Invalid value for missing: "skip" is not a valid missing.
  as_of   = msg.created_at # ERROR: as_of needs the table's history: as_of looks a row up as it was at an event time
}
table "versions" {
  input      = topic.customers
  history    = "0s" # ERROR: Invalid history: history is how long older versions are kept
  event_time = 1700000000000 # ERROR: Invalid event_time: A table's event_time must read the message
}
table "history" {
  input   = topic.customers
  history = "1h"
}
stage "as_of_dead_letter" {
  kind    = "lookup"
  input   = topic.orders
  table   = table.history
  key     = msg.customer_id
  as      = "customer"
  as_of   = msg.created_at
  missing = "dead_letter" # allowed: dead-lettered as its timer fires
}
sink "d" {
  kind  = "stdout"
  input = stage.as_of_dead_letter
}
sink "a" {
  kind  = "stdout"
  input = stage.unknown_table
}
sink "b" {
  kind  = "stdout"
  input = stage.wrong_ref
}
sink "c" {
  kind  = "stdout"
  input = stage.bad_attributes
}
