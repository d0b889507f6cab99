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
  global = true # ERROR: Not supported yet: A table's global is not supported yet
  ttl    = "30d" # ERROR: Not supported yet: A table's ttl is not supported yet
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
  as_of   = msg.created_at # ERROR: Not supported yet: A lookup's as_of is not supported yet
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
