typedef int gang__placeholder_24738;
