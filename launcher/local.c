typedef int gang__placeholder_31576;
