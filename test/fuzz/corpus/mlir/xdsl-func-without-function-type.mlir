"func.func"() <{sym_name = "f", function_typg = () -> ()}> ({
^bb0:
  "func.return"() : () -> ()
}) : () -> ()
