# A keyed topic of four partitions that a stdout sink reads: the pipeline of the publish API's
# tests (publish_test.go, hostile_test.go).

pipeline "publish" {}
topic "in" {
  partitions = 4
  key        = msg.k
}
sink "print" {
  kind  = "stdout"
  input = topic.in
}
