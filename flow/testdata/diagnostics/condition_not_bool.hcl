pipeline "t" {}
topic "orders" {}
topic "big" {}
source "in" {
  kind   = "stdin"
  output = topic.orders
}
stage "amount" {
  kind   = "filter"
  input  = topic.orders
  output = topic.big
  where  = msg.amount + 1 # ERROR: Condition is not a bool: where must be true or false, but msg.amount + 1 is always a number. Compare it, such as msg.amount + 1 > 0.
}
stage "yes" {
  kind  = "filter"
  input = topic.orders
  where = "yes" # ERROR: Condition is not a bool: where is the string "yes", which is not a bool: only the strings "true" and "false" convert to one.
}
stage "by_x" {
  kind  = "route"
  input = topic.orders
  case {
    when   = upper(msg.x) # ERROR: when must be true or false, but upper(msg.x) is always a string. Only the strings "true" and "false" convert to a bool; compare it instead, such as upper(msg.x) == "yes".
    output = topic.big
  }
  case {
    when   = msg.flag # a field may hold true or false: known only per message
    output = topic.big
  }
  case {
    when   = "true"
    output = topic.big
  }
  case {
    when   = [msg.a] # ERROR: is always a list. Test it, such as length([msg.a]) > 0.
    output = topic.big
  }
}
sink "out" {
  kind  = "stdout"
  input = topic.big
  where = { a = msg.a } # ERROR: is always an object. Test one of its fields instead.
}
sink "one" {
  kind  = "stdout"
  input = stage.yes
  where = 1 # ERROR: where is always the number 1; it must be true or false.
}
sink "nothing" {
  kind  = "stdout"
  input = stage.yes
  where = null # ERROR: where is null; it must be true or false.
}
