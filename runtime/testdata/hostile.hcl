# Its stage passes payload bytes on without decoding them (hostile_test.go): what hostile input
# does to a stage that does not look at it.

pipeline "hostile" {}
topic "in" {}
topic "out" {}
stage "pass" {
  kind   = "map"
  input  = topic.in
  output = topic.out
}
sink "print" {
  kind  = "stdout"
  input = topic.out
}
