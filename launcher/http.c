typedef int gang__placeholder_21707;
