typedef int gang__placeholder_23217;
