typedef int gang__placeholder_19138;
