pipeline "t" {}
topic "orders" {
  partitions 2 # ERROR: An argument or block definition is required here
}
