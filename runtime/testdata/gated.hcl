# Runs test.gate (see faults_test.go) on a one-partition topic, into a topic that a stdout sink
# reads (safety_test.go).

pipeline "gated" {}
topic "in" {}
topic "out" {}
stage "work" {
  kind   = "go"
  func   = "test.gate"
  input  = topic.in
  output = topic.out
}
sink "log" {
  kind  = "stdout"
  input = topic.out
}
