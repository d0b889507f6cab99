# Copies topic in to topic out through a map stage, with the given delivery; a stdout sink reads
# topic out (the tests run the stage alone: safety_test.go, access_test.go).

pipeline "copy" {
  delivery = var.delivery
}
variable "delivery" { default = "at_least_once" }
topic "in" {}
topic "out" {}
stage "work" {
  kind   = "map"
  input  = topic.in
  output = topic.out
  set    = { seen = true }
}
sink "log" {
  kind  = "stdout"
  input = topic.out
}
